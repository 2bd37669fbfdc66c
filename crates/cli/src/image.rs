// SPDX-License-Identifier: Apache-2.0
//! Disk images: create one with a file system, loop-mount it, unmount it.

use std::path::Path;
use std::process::Command;

/// File systems `insitu image create` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fs {
    /// ext4 (mkfs.ext4 from e2fsprogs).
    Ext4,
    /// XFS (mkfs.xfs from xfsprogs; at least 300 MiB).
    Xfs,
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run {:?}: {e} (is it installed? `make deps` installs it)", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

/// Creates a sparse image of `size` bytes at `path` holding a fresh file system.
pub fn create(path: &Path, size: u64, fs: Fs, block_size: Option<u32>, force: bool) -> Result<(), String> {
    if path.exists() && !force {
        return Err(format!("{} exists; pass --force to overwrite it", path.display()));
    }
    let min = match fs {
        Fs::Ext4 => 8 << 20,
        Fs::Xfs => 300 << 20,
    };
    if size < min {
        return Err(format!("an image of {size} bytes is too small for {fs:?}: it needs at least {} MiB", min >> 20));
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
pub fn mount(image: &Path, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    run(Command::new("mount").arg("-o").arg("loop").arg(image).arg(dir), "mount")
}

/// Unmounts `dir`; its loop device is released with it.
pub fn umount(dir: &Path) -> Result<(), String> {
    run(Command::new("umount").arg(dir), "umount")
}
