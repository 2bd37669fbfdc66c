// SPDX-License-Identifier: Apache-2.0
//! Host/container locks: DockerSSD's inode lock, from the host.
//!
//! While a container on a target holds a file or directory of the target's sharable
//! namespace, the host must not modify it. [`lock`] takes such a lock on a path of a file
//! system attached with `insitu attach`:
//!
//! 1. refuses if a process on this host has the path (or a file under it) open for
//!    writing: the paper's "accessible only if the inode reference counter is zero";
//! 2. `syncfs` on the file system, so the target holds the host's latest data;
//! 3. collects the path's blocks with FIEMAP (a directory: itself and everything under it
//!    on the same file system) and sends them in a LOCK command (`docs/lock-commands.md`):
//!    the target refuses host writes to those blocks and tells its containers;
//! 4. bind-mounts the path over itself and remounts the bind read-only, so a host writer
//!    gets "Read-only file system" (EROFS) at `open` or `write`, at once, instead of a
//!    write-back error later.
//!
//! [`unlock`] reverses it: the bind mount goes, then UNLOCK releases the fence, and the
//! target's containers see the host's changes from then on. It also drops this host's
//! cached pages of the path's files, so that what a container wrote into them in place
//! (`docker run -v /FILE:/DST:rw`) is read from the target, not from the page cache.
//!
//! Nothing is written to disk for a lock. A small record per lock in [`LOCK_DIR`] (a
//! tmpfs) lets another process release it or list it; a reboot of the host or a restart of
//! the target drops the lock, and [`unlock`] then releases what is left on the host side.

use crate::fiemap::{self, flags};
use insitu_attach::Attachment;
use insitu_fabric::opcode;
use insitu_initiator::{Command, InitiatorError, Session};
use insitu_proto::lock::{LockRequest, MAX_EXTENTS, MAX_PATH};
use serde::{Deserialize, Serialize};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where held locks are recorded (one JSON file each; /run is a tmpfs).
pub const LOCK_DIR: &str = "/run/insitu/locks";

/// What went wrong with a lock, on which path, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The path is not under a mount made by `insitu attach`.
    #[error("{}: not on a file system attached with `insitu attach URL DIR`; locks are for files a target's containers share with the host", path.display())]
    NotAttached {
        /// The path.
        path: PathBuf,
    },
    /// The path (or a path above or below it) is locked already.
    #[error("{}: already locked by lock {id:#x} on {}; `insitu unlock {}` releases it", path.display(), held.display(), held.display())]
    AlreadyLocked {
        /// The path asked for.
        path: PathBuf,
        /// The locked path that covers or lies under it.
        held: PathBuf,
        /// Its lock id.
        id: u64,
    },
    /// No lock is recorded for the path.
    #[error("{}: not locked (see `insitu lock --list`)", path.display())]
    NotLocked {
        /// The path.
        path: PathBuf,
    },
    /// A process has the path open for writing.
    #[error("{}: open for writing by process {pid} ({command}); close it first (a lock is taken only when no host writer holds the file)", file.display())]
    Busy {
        /// The open file.
        file: PathBuf,
        /// The writer's pid.
        pid: u32,
        /// The writer's command name.
        command: String,
    },
    /// The lock request cannot be expressed (too long a path, too many extents).
    #[error("{}: {reason}", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A host call failed (open, syncfs, FIEMAP, mount).
    #[error("{}: {what}: {detail}", path.display())]
    Host {
        /// The path.
        path: PathBuf,
        /// The step.
        what: &'static str,
        /// What it said.
        detail: String,
    },
    /// The target could not be reached, or refused the command.
    #[error("{}: {command} on {url}: {source}", path.display())]
    Target {
        /// The path.
        path: PathBuf,
        /// LOCK or UNLOCK.
        command: &'static str,
        /// The target's URL.
        url: String,
        /// The initiator's error (the NVMe status for a refusal).
        source: Box<InitiatorError>,
    },
}

fn host(path: &Path, what: &'static str, detail: impl std::fmt::Display) -> LockError {
    LockError::Host { path: path.to_path_buf(), what, detail: detail.to_string() }
}

/// A lock this host holds, as recorded in [`LOCK_DIR`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHandle {
    /// The locked path on this host (canonical).
    pub path: PathBuf,
    /// The same path relative to the attached file system's root, as the target knows it.
    pub relative: String,
    /// The mount point of the attached file system.
    pub mount: PathBuf,
    /// The target namespace's URL.
    pub url: String,
    /// The namespace.
    pub nsid: u32,
    /// The lock id the target returned.
    #[serde(rename = "lock_id")]
    pub id: u64,
    /// Extents fenced on the target.
    pub extents: usize,
    /// Bytes fenced on the target.
    pub bytes: u64,
}

/// What [`unlock`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unlocked {
    /// The lock released.
    pub lock: LockHandle,
    /// False when the target no longer held it (it restarted): only the host side was
    /// released.
    pub target_held: bool,
    /// Why the target did not hold it, when it did not.
    pub note: Option<String>,
}

impl LockHandle {
    /// Releases this lock; see [`unlock`].
    pub fn unlock(&self) -> Result<Unlocked, LockError> {
        unlock(&self.path)
    }
}

fn record_path(path: &Path) -> PathBuf {
    // FNV-1a of the path names the record; the record holds the path itself.
    let h = path.as_os_str().as_encoded_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    Path::new(LOCK_DIR).join(format!("{h:016x}.json"))
}

/// Every lock this host holds.
pub fn held() -> Vec<LockHandle> {
    let mut all: Vec<LockHandle> = std::fs::read_dir(LOCK_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    all.sort_by(|a, b| a.path.cmp(&b.path));
    all
}

/// The attachment whose mount holds `path` (the deepest one).
fn attachment_of(path: &Path) -> Result<Attachment, LockError> {
    insitu_attach::list()
        .into_iter()
        .filter(|a| path.starts_with(&a.dir))
        .max_by_key(|a| a.dir.as_os_str().len())
        .ok_or_else(|| LockError::NotAttached { path: path.to_path_buf() })
}

/// The path and every file and directory under it on the same file system (symbolic
/// links are not followed).
fn tree(path: &Path) -> Result<Vec<PathBuf>, LockError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| host(path, "stat", e))?;
    let mut out = vec![path.to_path_buf()];
    if !meta.is_dir() {
        return Ok(out);
    }
    let mut stack = vec![path.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| host(&d, "read_dir", e))? {
            let e = e.map_err(|err| host(&d, "read_dir", err))?;
            let m = std::fs::symlink_metadata(e.path()).map_err(|err| host(&e.path(), "stat", err))?;
            if m.dev() != meta.dev() {
                continue; // another file system mounted below
            }
            if m.is_dir() {
                stack.push(e.path());
                out.push(e.path());
            } else if m.is_file() {
                out.push(e.path());
            }
        }
    }
    Ok(out)
}

/// Drops the page cache of `path`'s files (best effort): a container may have written
/// them on the target, below this host's file system, which would otherwise keep serving
/// the bytes it read before. Pages still dirty or mapped stay.
fn drop_cached(path: &Path) {
    for f in tree(path).unwrap_or_default() {
        if let Ok(file) = std::fs::File::open(&f) {
            // SAFETY: posix_fadvise on a descriptor owned by `file`, open for the call.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Byte ranges of the namespace that hold `files`, 512-aligned, sorted and merged.
fn extents_of(files: &[PathBuf]) -> Result<Vec<(u64, u64)>, LockError> {
    let mut ranges = Vec::new();
    for f in files {
        let file = std::fs::File::open(f).map_err(|e| host(f, "open", e))?;
        let len = file.metadata().map_err(|e| host(f, "stat", e))?.len();
        if len == 0 {
            continue;
        }
        let map = fiemap::fiemap(&file, len).map_err(|e| host(f, "FIEMAP", e))?;
        for x in map.iter().filter(|x| x.flags & (flags::UNKNOWN | flags::DELALLOC | flags::DATA_INLINE) == 0) {
            let start = x.physical / 512 * 512;
            let end = x.physical.saturating_add(x.length).div_ceil(512) * 512;
            if end > start {
                ranges.push((start, end));
            }
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    Ok(merged.into_iter().map(|(s, e)| (s, e - s)).collect())
}

/// A process other than this one with one of `files` open for writing, if any.
fn writer_of(files: &[PathBuf]) -> Option<(PathBuf, u32, String)> {
    let me = std::process::id();
    let set: std::collections::HashSet<&Path> = files.iter().map(PathBuf::as_path).collect();
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            if !set.contains(target.as_path()) {
                continue;
            }
            let info = std::fs::read_to_string(p.path().join("fdinfo").join(fd.file_name())).unwrap_or_default();
            let fl = info.lines().find_map(|l| l.strip_prefix("flags:")).and_then(|v| u32::from_str_radix(v.trim(), 8).ok()).unwrap_or(0);
            if fl & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32 {
                let command = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default().trim().to_string();
                return Some((target, pid, command));
            }
        }
    }
    None
}

fn run(path: &Path, args: &[&str]) -> Result<(), LockError> {
    let out = std::process::Command::new(args[0]).args(&args[1..]).output().map_err(|e| host(path, "mount", format!("{}: {e}", args[0])))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(host(path, "mount", format!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

fn connect(att: &Attachment, path: &Path, command: &'static str) -> Result<Session, LockError> {
    let o = att.connect_options().map_err(|e| host(path, "target URL", e))?;
    Session::connect(o).map_err(|e| LockError::Target { path: path.to_path_buf(), command, url: att.url.clone(), source: Box::new(e) })
}

/// Locks `path` (a file or directory under a mount made by `insitu attach`) for the
/// target's containers; see the module documentation for the steps. On error nothing is
/// left locked.
pub fn lock(path: &Path) -> Result<LockHandle, LockError> {
    let path = std::fs::canonicalize(path).map_err(|e| host(path, "canonicalize", e))?;
    let att = attachment_of(&path)?;
    if let Some(h) = held().into_iter().find(|h| h.path.starts_with(&path) || path.starts_with(&h.path)) {
        return Err(LockError::AlreadyLocked { path, held: h.path, id: h.id });
    }
    let relative = match path.strip_prefix(&att.dir).map(|r| r.to_string_lossy().into_owned()) {
        Ok(r) if !r.is_empty() => r,
        _ => ".".to_string(),
    };
    if relative.len() > MAX_PATH {
        return Err(LockError::TooLarge { path, reason: format!("its path is {} bytes long; a lock names at most {MAX_PATH}", relative.len()) });
    }
    let files = tree(&path)?;
    if let Some((file, pid, command)) = writer_of(&files) {
        return Err(LockError::Busy { file, pid, command });
    }
    // The target must hold the host's latest data before a container reads it.
    let f = std::fs::File::open(&path).map_err(|e| host(&path, "open", e))?;
    // SAFETY: syncfs on a descriptor owned by `f`, open for the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(host(&path, "syncfs", std::io::Error::last_os_error()));
    }
    drop(f);
    let extents = extents_of(&files)?;
    if extents.len() > MAX_EXTENTS {
        return Err(LockError::TooLarge {
            path,
            reason: format!("{} extents; a lock holds at most {MAX_EXTENTS}: lock its subdirectories separately", extents.len()),
        });
    }
    let bytes = extents.iter().map(|e| e.1).sum();
    let payload = LockRequest { path: relative.clone(), extents }.encode();
    let session = connect(&att, &path, "LOCK")?;
    if payload.len() > session.max_transfer() {
        let _ = session.disconnect();
        return Err(LockError::TooLarge {
            path,
            reason: format!(
                "the lock request is {} bytes, over the target's {}-byte transfer limit: lock its subdirectories separately",
                payload.len(),
                session.max_transfer()
            ),
        });
    }
    let mut cmd = Command::zeroed();
    cmd.set_opcode(opcode::LOCK).set_nsid(att.nsid);
    let sent = session.submit(cmd, Some(&payload), 0);
    let _ = session.disconnect();
    let target_err = |e| LockError::Target { path: path.clone(), command: "LOCK", url: att.url.clone(), source: Box::new(e) };
    let (cqe, _) = sent.map_err(target_err)?;
    if let Some(e) = status_error("LOCK", cqe.status) {
        return Err(target_err(e));
    }
    let handle = LockHandle {
        path: path.clone(),
        relative,
        mount: att.dir.clone(),
        url: att.url.clone(),
        nsid: att.nsid,
        id: u64::from(cqe.dw0) | (u64::from(cqe.dw1) << 32),
        extents: payload_extents(&payload),
        bytes,
    };
    // Record first, so that whatever fails next can be released with `insitu unlock`.
    let recorded = std::fs::create_dir_all(LOCK_DIR)
        .and_then(|()| std::fs::write(record_path(&path), serde_json::to_vec_pretty(&handle).unwrap_or_default()))
        .map_err(|e| host(Path::new(LOCK_DIR), "record the lock", e));
    let p = path.to_string_lossy();
    let base = mounts_at(&path);
    let bound = recorded.and_then(|()| run(&path, &["mount", "--bind", &p, &p]));
    if let Err(e) = bound.and_then(|()| run(&path, &["mount", "-o", "remount,bind,ro", &p])) {
        while mounts_at(&path) > base && run(&path, &["umount", &p]).is_ok() {}
        let _ = std::fs::remove_file(record_path(&path));
        let _ = release_on_target(&att, &handle);
        return Err(e);
    }
    Ok(handle)
}

fn payload_extents(payload: &[u8]) -> usize {
    payload.get(8..12).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// An initiator error for a completion's status field, if it is not a success.
fn status_error(command: &'static str, status: u16) -> Option<InitiatorError> {
    let (sct, sc) = (((status >> 8) & 7) as u8, (status & 0xFF) as u8);
    (sct != 0 || sc != 0).then_some(InitiatorError::Status { command, sct, sc, dnr: status & (1 << 14) != 0 })
}

fn release_on_target(att: &Attachment, h: &LockHandle) -> Result<bool, LockError> {
    let session = connect(att, &h.path, "UNLOCK")?;
    let mut cmd = Command::zeroed();
    cmd.set_opcode(opcode::UNLOCK).set_nsid(h.nsid).set_cdw(10, h.id as u32).set_cdw(11, (h.id >> 32) as u32);
    let r = session.submit(cmd, None, 0);
    let _ = session.disconnect();
    let (cqe, _) = r.map_err(|e| LockError::Target { path: h.path.clone(), command: "UNLOCK", url: att.url.clone(), source: Box::new(e) })?;
    Ok(cqe.status & 0x7FFF == 0)
}

/// How many mounts sit at `path` (a lock's read-only bind is one; an attached file
/// system's root is one more).
fn mounts_at(path: &Path) -> usize {
    let want = path.to_string_lossy().replace('\\', "\\134").replace(' ', "\\040").replace('\t', "\\011").replace('\n', "\\012");
    std::fs::read_to_string("/proc/self/mountinfo").map_or(0, |m| m.lines().filter(|l| l.split(' ').nth(4) == Some(want.as_str())).count())
}

/// Releases the lock on `path`: removes the read-only bind mount, then sends UNLOCK. A
/// target that restarted meanwhile holds no lock: the host side is released all the same
/// and [`Unlocked::target_held`] is false. Errors leave the record in place, so the call
/// can be repeated.
pub fn unlock(path: &Path) -> Result<Unlocked, LockError> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let rec = record_path(&path);
    let lock: LockHandle = std::fs::read(&rec).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| LockError::NotLocked { path: path.clone() })?;
    let p = path.to_string_lossy();
    // The attached file system's own mount stays when its root was locked.
    let base = usize::from(path == lock.mount);
    while mounts_at(&path) > base {
        run(&path, &["umount", &p])?;
    }
    let att = insitu_attach::list().into_iter().find(|a| a.dir == lock.mount && a.url == lock.url);
    let (target_held, note) = match att {
        None => (false, Some(format!("{} is no longer attached", lock.mount.display()))),
        Some(att) => match release_on_target(&att, &lock) {
            Ok(true) => (true, None),
            Ok(false) => (false, Some("the target no longer held it (a restart drops every lock)".to_string())),
            Err(e) => return Err(e),
        },
    };
    drop_cached(&path);
    std::fs::remove_file(&rec).map_err(|e| host(&rec, "remove the lock record", e))?;
    Ok(Unlocked { lock, target_held, note })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_named_by_path() {
        assert_ne!(record_path(Path::new("/mnt/a")), record_path(Path::new("/mnt/b")));
        assert!(record_path(Path::new("/mnt/a")).starts_with(LOCK_DIR));
    }

    #[test]
    fn extents_are_sorted_merged_and_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, vec![7u8; 100_000]).unwrap();
        let Ok(x) = extents_of(std::slice::from_ref(&f)) else { return }; // no FIEMAP here (tmpfs)
        assert!(x.iter().all(|&(o, l)| o % 512 == 0 && l % 512 == 0 && l > 0));
        assert!(x.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
    }

    #[test]
    fn a_writer_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("w");
        std::fs::write(&f, b"x").unwrap();
        let f = std::fs::canonicalize(&f).unwrap();
        assert!(writer_of(std::slice::from_ref(&f)).is_none());
        let mut child = std::process::Command::new("sh").arg("-c").arg(format!("exec 3>>'{}'; sleep 5", f.display())).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut found = None;
        while found.is_none() && std::time::Instant::now() < deadline {
            found = writer_of(std::slice::from_ref(&f));
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.map(|(p, pid, _)| (p, pid)), Some((f, child.id())));
    }

    #[test]
    fn unknown_paths_are_not_locked() {
        assert!(matches!(unlock(Path::new("/nonexistent/insitu-lock-test")), Err(LockError::NotLocked { .. })));
        assert!(matches!(lock(Path::new("/")), Err(LockError::NotAttached { .. }) | Err(LockError::AlreadyLocked { .. })));
    }
}
