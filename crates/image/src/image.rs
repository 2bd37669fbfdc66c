// SPDX-License-Identifier: Apache-2.0
//! Disk images: create one with a file system, loop-mount it, unmount it; and a scratch
//! image that is mounted for one benchmark (or the demo) and removed afterwards.

use crate::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

/// File systems an image can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// ext4 (mkfs.ext4 from e2fsprogs).
    Ext4,
    /// XFS (mkfs.xfs from xfsprogs; at least 300 MiB).
    Xfs,
}

fn run(cmd: &mut Command, what: &str) -> Result<(), Error> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run {:?}: {e} (is it installed? `make deps` installs it)", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim()).into());
    }
    Ok(())
}

/// Creates a sparse image of `size` bytes at `path` holding a fresh file system.
pub fn create(path: &Path, size: u64, fs: Fs, block_size: Option<u32>, force: bool) -> Result<(), Error> {
    if path.exists() && !force {
        return Err(format!("{} exists; pass --force to overwrite it", path.display()).into());
    }
    let min = match fs {
        Fs::Ext4 => 8 << 20,
        Fs::Xfs => 300 << 20,
    };
    if size < min {
        return Err(format!("an image of {size} bytes is too small for {fs:?}: it needs at least {} MiB", min >> 20).into());
    }
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(size).map_err(|e| format!("{}: {e}", path.display()))?;
    drop(f);
    let mut cmd = match fs {
        Fs::Ext4 => {
            let mut c = Command::new("mkfs.ext4");
            c.args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]);
            if let Some(b) = block_size {
                c.args(["-b", &b.to_string()]);
            }
            c
        }
        Fs::Xfs => {
            let mut c = Command::new("mkfs.xfs");
            c.args(["-q", "-f"]);
            if let Some(b) = block_size {
                c.args(["-b", &format!("size={b}")]);
            }
            c
        }
    };
    cmd.arg(path);
    run(&mut cmd, "mkfs").inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// Loop-mounts the image at `dir` (created if missing).
pub fn mount(image: &Path, dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    run(Command::new("mount").arg("-o").arg("loop").arg(image).arg(dir), "mount")
}

/// Unmounts `dir`; its loop device is released with it.
pub fn umount(dir: &Path) -> Result<(), Error> {
    run(Command::new("umount").arg(dir), "umount")
}

/// A scratch directory holding an image mounted at `mnt`; unmounted and removed on drop.
pub struct Scratch {
    /// The work directory.
    pub root: PathBuf,
    /// The image file in it.
    pub image: PathBuf,
    /// Where the image is mounted.
    pub mnt: PathBuf,
    remove_root: bool,
    mounted: bool,
}

impl Scratch {
    /// Creates an image of `size` bytes holding `fs` under `dir` (default: a new directory
    /// `/var/tmp/insitu-TAG-PID`, removed on drop) and mounts it.
    pub fn new(dir: Option<PathBuf>, tag: &str, size: u64, fs: Fs) -> Result<Scratch, Error> {
        let remove_root = dir.is_none();
        let root = dir.unwrap_or_else(|| PathBuf::from(format!("/var/tmp/insitu-{tag}-{}", std::process::id())));
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let mut s = Scratch { image: root.join(format!("{tag}.img")), mnt: root.join("mnt"), root, remove_root, mounted: false };
        create(&s.image, size, fs, None, true)?;
        mount(&s.image, &s.mnt)?;
        s.mounted = true;
        Ok(s)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.mounted {
            let _ = umount(&self.mnt);
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mnt);
        if self.remove_root {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
