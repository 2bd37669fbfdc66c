// SPDX-License-Identifier: Apache-2.0
//! Finding the namespace behind a file: from the file's device number, through sysfs, to the
//! loop device's backing file and the byte offset where the file system starts in it.

use crate::OasError;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a block device's bytes live: `backing[offset + device_byte]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMap {
    /// Kernel name of the block device, e.g. `loop3` or `loop3p1`.
    pub device: String,
    /// The file or block device the loop device reads.
    pub backing: PathBuf,
    /// Byte offset of the device's first byte in `backing` (loop offset plus partition start).
    pub offset: u64,
}

/// `major:minor` of a `st_dev`.
pub fn dev_numbers(dev: u64) -> (u64, u64) {
    (libc::major(dev) as u64, libc::minor(dev) as u64)
}

/// Resolves the block device `dev` (a `st_dev`) holding `path` to its backing store.
///
/// Works for any loop device (made by `insitu image mount`, `mount -o loop` or `losetup`),
/// including partitions of one. Anything else is not an insitu device and is refused.
pub fn resolve(dev: u64, path: &Path) -> Result<DeviceMap, OasError> {
    let (major, minor) = dev_numbers(dev);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let real = fs::canonicalize(&sys).map_err(|_| not_insitu(path, format!("{major}:{minor} (no block device; a virtual or network file system?)")))?;
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (disk_dir, part_start) = if real.join("partition").exists() {
        let start = read_u64(&real.join("start"))? * 512;
        (real.parent().map(Path::to_path_buf).unwrap_or_default(), start)
    } else {
        (real.clone(), 0)
    };
    let loop_dir = disk_dir.join("loop");
    let backing = match fs::read_to_string(loop_dir.join("backing_file")) {
        Ok(s) => s.trim_end_matches('\n').to_owned(),
        Err(_) => return Err(not_insitu(path, format!("{name} ({major}:{minor}), which is not a loop device"))),
    };
    if backing.ends_with(" (deleted)") {
        return Err(not_insitu(path, format!("{name}, whose backing file {backing}")));
    }
    let offset = read_u64(&loop_dir.join("offset"))? + part_start;
    Ok(DeviceMap { device: name, backing: PathBuf::from(backing), offset })
}

/// The root of the mount holding `path`: the highest ancestor on the same device.
pub fn mount_root(path: &Path) -> std::io::Result<PathBuf> {
    let path = fs::canonicalize(path)?;
    let dev = fs::metadata(&path)?.dev();
    let mut root = if path.is_dir() { path.clone() } else { path.parent().map(Path::to_path_buf).unwrap_or_default() };
    while let Some(parent) = root.parent() {
        if fs::metadata(parent)?.dev() != dev {
            break;
        }
        root = parent.to_path_buf();
    }
    Ok(root)
}

fn read_u64(p: &Path) -> Result<u64, OasError> {
    let s = fs::read_to_string(p).map_err(|e| OasError::Io { path: p.to_owned(), source: e })?;
    s.trim().parse().map_err(|_| OasError::Io { path: p.to_owned(), source: std::io::Error::other(format!("unexpected contents {s:?}")) })
}

fn not_insitu(path: &Path, what: String) -> OasError {
    OasError::NotInsituDevice { path: path.to_owned(), device: what }
}
