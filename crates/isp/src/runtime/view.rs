// SPDX-License-Identifier: Apache-2.0
//! The target's read-only view of its sharable namespace, which containers see at `/data`.
//!
//! The host mounts the sharable namespace's file system read-write; two independent
//! mounts of one file system never see each other's caches, so the target mounts it
//! read-only and without replaying the journal (the host owns it), and takes a *fresh*
//! mount whenever it must see the host's latest data: at start, and whenever a lock is
//! taken or released (DockerSSD's inode lock, which invalidates the stale view). The fresh
//! mount is stacked on a shared mount point, so it reaches running containers too: their
//! `/data` is a slave of that point.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::RuntimeError;

/// A read-only, refreshable view of a namespace image.
pub struct SharableView {
    image: Option<PathBuf>,
    dir: PathBuf,
    generation: Mutex<u64>,
    /// The loop device (major, minor) of the newest mount.
    device: Mutex<Option<(u32, u32)>>,
}

impl SharableView {
    /// The view of `image` (a file or block device holding a file system, or `None` for an
    /// empty `/data`), kept under `dir`. Call [`SharableView::refresh`] to mount it.
    pub fn new(image: Option<&Path>, dir: &Path) -> Result<SharableView, RuntimeError> {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|e| RuntimeError::io(&data, e))?;
        if !is_mount_point(&data) {
            // A shared mount point of its own, so later mounts on it propagate to the
            // containers' slave copies.
            run("mount", &["--bind", &path_str(&data), &path_str(&data)])?;
            run("mount", &["--make-shared", &path_str(&data)])?;
        }
        Ok(SharableView { image: image.map(Path::to_path_buf), dir: dir.to_path_buf(), generation: Mutex::new(0), device: Mutex::new(None) })
    }

    /// The namespace's image or block device, if any.
    pub fn image(&self) -> Option<&Path> {
        self.image.as_deref()
    }

    /// The directory containers bind at `/data`.
    pub fn path(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Mounts the namespace afresh and puts the new mount on top of [`SharableView::path`]:
    /// every lookup from now on sees the file system as the media holds it now.
    pub fn refresh(&self) -> Result<(), RuntimeError> {
        let Some(image) = &self.image else { return Ok(()) };
        let mut g = self.generation.lock().unwrap_or_else(|e| e.into_inner());
        if !has_file_system(image) {
            return Ok(());
        }
        *g += 1;
        let fresh = self.dir.join(format!("gen-{}", *g));
        std::fs::create_dir_all(&fresh).map_err(|e| RuntimeError::io(&fresh, e))?;
        let fstype = fs_type(image);
        // ext4 must not replay the journal of a file system the host has mounted; xfs the same.
        let opts = match fstype.as_str() {
            "xfs" => "ro,norecovery,nouuid",
            "ext4" | "ext3" => "ro,noload",
            _ => "ro",
        };
        // A loop device of its own, read-only: `mount -o loop` would refuse a file the host
        // has mounted already, and a device shared with the host would share its cache.
        let out = Command::new("losetup").args(["--find", "--show", "--read-only"]).arg(image).output()
            .map_err(|e| RuntimeError::Setup(format!("losetup: {e}")))?;
        if !out.status.success() {
            return Err(RuntimeError::Setup(format!("losetup {}: {}", image.display(), String::from_utf8_lossy(&out.stderr).trim())));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if let Err(e) = run("mount", &["-o", opts, &dev, &path_str(&fresh)]) {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
            return Err(e);
        }
        *self.device.lock().unwrap_or_else(|e| e.into_inner()) = device_number(&dev);
        // Detaching now only marks it: the kernel frees it when the last mount goes.
        let _ = Command::new("losetup").args(["-d", &dev]).status();
        let data = path_str(&self.path());
        run("mount", &["--bind", &path_str(&fresh), &data])?;
        // The previous generation stays pinned only by what still uses it.
        if *g > 1 {
            let old = self.dir.join(format!("gen-{}", *g - 1));
            let _ = Command::new("umount").arg("-l").arg(&old).status();
        }
        Ok(())
    }

    /// The block device (major, minor) the newest view is mounted from; `None` before the
    /// first [`SharableView::refresh`] that mounted one.
    pub fn device(&self) -> Option<(u32, u32)> {
        *self.device.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Unmounts everything the view mounted (at shutdown).
    pub fn close(&self) {
        let data = self.path();
        for _ in 0..64 {
            if !is_mount_point(&data) {
                break;
            }
            if Command::new("umount").arg("-l").arg(&data).status().map_or(true, |s| !s.success()) {
                break;
            }
        }
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("gen-") {
                    let _ = Command::new("umount").arg("-l").arg(e.path()).status();
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }
}

fn device_number(dev: &str) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).ok()?.rdev();
    Some((libc::major(rdev), libc::minor(rdev)))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn run(cmd: &str, args: &[&str]) -> Result<(), RuntimeError> {
    let out = Command::new(cmd).args(args).output().map_err(|e| RuntimeError::Setup(format!("{cmd}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(RuntimeError::Setup(format!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Whether `p` is a mount point (listed in /proc/self/mountinfo).
pub(crate) fn is_mount_point(p: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(p) else { return false };
    let want = canon.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str())))
        .unwrap_or(false)
}

fn fs_type(image: &Path) -> String {
    Command::new("blkid").args(["-p", "-o", "value", "-s", "TYPE"]).arg(image).output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn has_file_system(image: &Path) -> bool {
    !fs_type(image).is_empty()
}
