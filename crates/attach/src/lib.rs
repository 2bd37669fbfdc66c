// SPDX-License-Identifier: Apache-2.0
//! Attaching a remote NVMe/TCP namespace to this host as a mounted file system, without the
//! kernel's NVMe/TCP initiator: a daemon serves the namespace as a FUSE file
//! ([`fuse::DiskFs`]), a loop device turns the file into a block device, and the file system
//! on it is mounted at the directory the user chose.
//!
//! Because the loop device's backing file is the FUSE file, insitu's host library finds the
//! target of any file under the mount the same way it finds an image: through the loop
//! device's backing file, then [`lookup_disk`] names the URL behind it. EXEC then goes over
//! the fabric with no extra flags.
//!
//! Attachments are recorded in `/run/insitu/attach/ID.json` ([`Attachment`]).
#![deny(missing_docs)]

pub mod fuse;
mod url;

pub use url::{TargetUrl, UrlError};

use insitu_initiator::{default_hostnqn, ConnectOptions, Session};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where attachments are recorded and their FUSE files mounted.
pub const RUN_DIR: &str = "/run/insitu/attach";

/// One attached namespace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Attachment {
    /// The target URL, namespace included.
    pub url: String,
    /// Host NQN used to connect.
    pub hostnqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// Namespace size in bytes.
    pub size: u64,
    /// Logical block size.
    pub lba_size: u32,
    /// Where the file system is mounted.
    pub dir: PathBuf,
    /// The FUSE file standing for the namespace.
    pub disk: PathBuf,
    /// The loop device over it.
    pub loop_device: String,
    /// Pid of the FUSE daemon.
    pub pid: i32,
}

impl Attachment {
    /// Parsed URL.
    pub fn target_url(&self) -> Result<TargetUrl, UrlError> {
        TargetUrl::parse(&self.url)
    }

    /// Connection options for this attachment's target.
    pub fn connect_options(&self) -> Result<ConnectOptions, AttachError> {
        let u = self.target_url()?;
        let mut o = ConnectOptions::new(u.address(), u.nqn);
        o.hostnqn = self.hostnqn.clone();
        Ok(o)
    }
}

/// Why attaching or detaching failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The URL is malformed.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The target could not be reached or refused.
    #[error("{url}: {source}")]
    Target {
        /// The URL.
        url: String,
        /// The initiator's error.
        source: insitu_initiator::InitiatorError,
    },
    /// A host step failed (mount, losetup, mkfs), with what it printed.
    #[error("{0}")]
    Host(String),
}

fn host_err(what: &str, e: impl std::fmt::Display) -> AttachError {
    AttachError::Host(format!("{what}: {e}"))
}

/// File systems `--format` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// mkfs.ext4.
    Ext4,
    /// mkfs.xfs.
    Xfs,
}

fn run(cmd: &mut Command, what: &str) -> Result<String, AttachError> {
    let out = cmd.output().map_err(|e| host_err(what, e))?;
    if !out.status.success() {
        return Err(AttachError::Host(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Every recorded attachment.
pub fn list() -> Vec<Attachment> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(RUN_DIR) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "json") {
                if let Some(a) = std::fs::read_to_string(e.path()).ok().and_then(|t| serde_json::from_str(&t).ok()) {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// The attachment whose FUSE file is `disk` (a loop device's backing file), if any.
pub fn lookup_disk(disk: &Path) -> Option<Attachment> {
    list().into_iter().find(|a| a.disk == disk)
}

fn record_path(id: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{id}.json"))
}

fn id_for(url: &TargetUrl, dir: &Path) -> String {
    let c = (u64::from(crc32(url.to_string().as_bytes())) << 32) | u64::from(crc32(dir.to_string_lossy().as_bytes()));
    format!("{c:016x}")
}

fn crc32(b: &[u8]) -> u32 {
    // FNV-1a folded: only used to name directories.
    let mut h: u32 = 0x811c_9dc5;
    for x in b {
        h = (h ^ u32::from(*x)).wrapping_mul(0x0100_0193);
    }
    h
}

/// Attaches `url` at `dir`: FUSE daemon, loop device, optional mkfs, mount.
///
/// Nothing is left behind on failure.
pub fn attach(url: &str, dir: &Path, format: Option<Format>, hostnqn: Option<String>) -> Result<Attachment, AttachError> {
    let url = TargetUrl::parse(url)?;
    let nsid = url.nsid.unwrap_or(1);
    let hostnqn = hostnqn.unwrap_or_else(default_hostnqn);
    let dir = std::fs::canonicalize(dir)
        .or_else(|_| std::fs::create_dir_all(dir).and_then(|_| std::fs::canonicalize(dir)))
        .map_err(|e| host_err(&dir.display().to_string(), e))?;
    if list().iter().any(|a| a.dir == dir) {
        return Err(AttachError::Host(format!("{} already has a namespace attached; `insitu detach {}` first", dir.display(), dir.display())));
    }
    let mut opts = ConnectOptions::new(url.address(), url.nqn.clone());
    opts.hostnqn = hostnqn.clone();
    let target_err = |e| AttachError::Target { url: url.to_string(), source: e };
    // Probe first, so a wrong URL fails here with the target's own answer.
    let probe = Session::connect(opts.clone()).map_err(target_err)?;
    let ns = probe.identify_namespace(nsid).map_err(target_err)?;
    let _ = probe.disconnect();
    let (size, lba) = (ns.size_bytes(), ns.lba_size);
    let id = id_for(&url, &dir);
    let fuse_dir = Path::new(RUN_DIR).join(&id);
    std::fs::create_dir_all(&fuse_dir).map_err(|e| host_err(&fuse_dir.display().to_string(), e))?;
    let disk = fuse_dir.join(fuse::DISK);
    let log = Path::new(RUN_DIR).join(format!("{id}.log"));
    // The child only sets itself up and serves the file system it owns; this process holds
    // no session or thread it depends on (the probe above disconnected first). It comes up
    // when its disk file has the namespace's size, which the wait below watches for.
    let pid = insitu_detach::spawn(|_| serve_fuse(opts, nsid, lba, size, &fuse_dir, &log)).map_err(AttachError::Host)?.pid;
    let mut a = Attachment {
        url: format!("nvme-tcp://{}/{}/{nsid}", url.address(), url.nqn),
        hostnqn,
        nsid,
        size,
        lba_size: lba,
        dir,
        disk,
        loop_device: String::new(),
        pid,
    };
    let undo = |a: &Attachment| undo(a, &fuse_dir);
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::fs::metadata(&a.disk).map(|m| m.len()).unwrap_or(0) != size {
        if Instant::now() > deadline {
            undo(&a);
            return Err(AttachError::Host(format!("the FUSE daemon did not come up; see {}", log.display())));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut losetup = Command::new("losetup");
    losetup.args(["--find", "--show", "--sector-size", &lba.to_string()]).arg(&a.disk);
    a.loop_device = match run(&mut losetup, "losetup") {
        Ok(dev) => dev,
        Err(e) => {
            undo(&a);
            return Err(e);
        }
    };
    if let Some(f) = format {
        let mut mkfs = match f {
            Format::Ext4 => {
                let mut c = Command::new("mkfs.ext4");
                c.args(["-q", "-F", "-E", "nodiscard"]);
                c
            }
            Format::Xfs => {
                let mut c = Command::new("mkfs.xfs");
                c.args(["-q", "-f", "-K"]);
                c
            }
        };
        if let Err(e) = run(mkfs.arg(&a.loop_device), "mkfs") {
            undo(&a);
            return Err(e);
        }
    }
    if let Err(e) = run(Command::new("mount").arg(&a.loop_device).arg(&a.dir), "mount") {
        undo(&a);
        return Err(e);
    }
    let text = serde_json::to_string_pretty(&a).map_err(|e| host_err("record", e))?;
    std::fs::write(record_path(&id), text).map_err(|e| host_err("record", e))?;
    Ok(a)
}

/// The attachment's daemon: serves the namespace as a FUSE disk file until it is unmounted;
/// returns the exit code.
fn serve_fuse(opts: ConnectOptions, nsid: u32, lba: u32, size: u64, fuse_dir: &Path, log: &Path) -> i32 {
    let _ = insitu_detach::to_log(log);
    match Session::connect(opts) {
        Ok(s) => {
            let fs = fuse::DiskFs::new(Arc::new(s), nsid, lba, size, 4);
            let options = [fuser::MountOption::FSName("insitu".into()), fuser::MountOption::DefaultPermissions];
            match fuser::mount2(fs, fuse_dir, &options) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("insitu attach: FUSE mount at {}: {e}", fuse_dir.display());
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("insitu attach: {e}");
            1
        }
    }
}

fn undo(a: &Attachment, fuse_dir: &Path) {
    if !a.loop_device.is_empty() {
        let _ = Command::new("losetup").arg("-d").arg(&a.loop_device).output();
    }
    let _ = Command::new("umount").arg(fuse_dir).output();
    if a.pid > 0 {
        // Unmounting ends the daemon's session loop; give it a moment to exit, reaping it
        // if it is our child, before forcing it.
        if !insitu_detach::wait_gone(a.pid, Duration::from_secs(5)) {
            insitu_detach::force(a.pid);
        }
    }
    let _ = std::fs::remove_dir(fuse_dir);
}

/// Unmounts `dir`, releases its loop device and stops its FUSE daemon.
pub fn detach(dir: &Path) -> Result<Attachment, AttachError> {
    let dir = std::fs::canonicalize(dir).map_err(|e| host_err(&dir.display().to_string(), e))?;
    let a = list().into_iter().find(|a| a.dir == dir).ok_or_else(|| AttachError::Host(format!("nothing is attached at {}", dir.display())))?;
    run(Command::new("umount").arg(&a.dir), "umount")?;
    let fuse_dir = a.disk.parent().map(Path::to_path_buf).unwrap_or_default();
    undo(&a, &fuse_dir);
    let id = fuse_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let _ = std::fs::remove_file(record_path(&id));
    Ok(a)
}
