// SPDX-License-Identifier: Apache-2.0
//! The target's read-only view of its sharable namespace, which containers see at `/data`.
//!
//! The host mounts the sharable namespace's file system read-write; two independent
//! mounts of one file system never see each other's caches, so the target mounts it
//! read-only and without replaying the journal (the host owns it), and takes a *fresh*
//! mount whenever it must see the host's latest data: when a container starts, and
//! whenever a lock is taken or released (DockerSSD's inode lock, which invalidates the
//! stale view).
//!
//! The fresh mounts are *layers* on a shared mount point. A container's `/data` is a slave
//! copy of the layer on top when it starts, so it sees every later change made on that
//! layer's root. A refresh therefore:
//! - *replaces* the top layer when no running container started on it: the fresh mount
//!   goes beneath the top (`move_mount(2)` with `MOVE_MOUNT_BENEATH`, Linux 6.5) and the
//!   top is unmounted, so nothing is ever empty and containers that started on a lower
//!   layer see the change (both steps propagate to their copies);
//! - *stacks* a new layer when a running container started on the top one, so that one
//!   sees it too;
//! - collapses the stack to one layer when no container runs at all (and so does the
//!   end of the last running container's run).
//!
//! So the view holds one loop device and one mount per layer, and at most one layer more
//! than there are running containers, whatever containers and locks do. Without
//! `MOVE_MOUNT_BENEATH` (older kernels) every refresh stacks until no container runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::RuntimeError;

/// A read-only, refreshable view of a namespace image.
pub struct SharableView {
    image: Option<PathBuf>,
    dir: PathBuf,
    layers: Mutex<Layers>,
}

/// The layers mounted on the view's path, bottom first.
#[derive(Default)]
struct Layers {
    /// The generation of the newest mount.
    generation: u64,
    stack: Vec<Layer>,
    /// The loop device (major, minor) of the newest mount.
    device: Option<(u32, u32)>,
    /// Whether the top can be replaced in place; cleared when the kernel refuses.
    beneath_works: bool,
}

struct Layer {
    generation: u64,
    /// Running containers whose `/data` is a copy of this layer.
    pins: usize,
}

/// Held by a running container for the layer its `/data` copies; dropping it (when the
/// run ends) lets the next refresh replace that layer instead of stacking on it.
pub struct ViewPin {
    view: Weak<SharableView>,
    generation: u64,
}

impl Drop for ViewPin {
    fn drop(&mut self) {
        if let Some(view) = self.view.upgrade() {
            let mut layers = view.lock();
            if let Some(l) = layers.stack.iter_mut().find(|l| l.generation == self.generation) {
                l.pins = l.pins.saturating_sub(1);
            }
            // The last running container is gone: the layers stacked for the runs go now
            // (with their loop devices), not at the next refresh, which may never come.
            if layers.stack.iter().all(|l| l.pins == 0) {
                let data = view.path();
                while layers.stack.len() > 1 && unmount_top(&data).is_ok() {
                    layers.stack.pop();
                }
            }
        }
    }
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
        let layers = Layers { beneath_works: true, ..Layers::default() };
        Ok(SharableView { image: image.map(Path::to_path_buf), dir: dir.to_path_buf(), layers: Mutex::new(layers) })
    }

    /// The namespace's image or block device, if any.
    pub fn image(&self) -> Option<&Path> {
        self.image.as_deref()
    }

    /// The directory containers bind at `/data`.
    pub fn path(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn lock(&self) -> MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mounts the namespace afresh and makes that mount what [`SharableView::path`] shows:
    /// every lookup from now on, in running containers too, sees the file system as the
    /// media holds it now.
    pub fn refresh(&self) -> Result<(), RuntimeError> {
        self.refresh_locked(&mut self.lock())
    }

    /// [`SharableView::refresh`] for a container about to start: its `/data` will copy the
    /// top layer, which the returned pin keeps from being replaced while the container runs.
    pub fn refresh_for_start(self: &Arc<Self>) -> Result<Option<ViewPin>, RuntimeError> {
        let mut layers = self.lock();
        self.refresh_locked(&mut layers)?;
        Ok(layers.stack.last_mut().map(|top| {
            top.pins += 1;
            ViewPin { view: Arc::downgrade(self), generation: top.generation }
        }))
    }

    fn refresh_locked(&self, layers: &mut Layers) -> Result<(), RuntimeError> {
        let Some(image) = &self.image else { return Ok(()) };
        let fstype = fs_type(image);
        if fstype.is_empty() {
            return Ok(());
        }
        layers.generation += 1;
        let fresh = self.dir.join(format!("gen-{}", layers.generation));
        layers.device = Some(mount_fresh(image, &fstype, &fresh)?);
        let placed = self.place(layers, &fresh);
        if let Err(e) = &placed {
            eprintln!("insitu-isp: refreshing the view of {}: {e}", image.display());
        }
        // The layer holds the file system now (or the refresh failed): the mount point it
        // came from is not needed either way.
        let _ = umount2(&fresh, libc::MNT_DETACH);
        let _ = std::fs::remove_dir(&fresh);
        placed
    }

    /// Puts the mount at `fresh` where `/data` shows it: one layer when no container runs,
    /// in place of the top one when no running container started on it, else on top.
    fn place(&self, layers: &mut Layers, fresh: &Path) -> Result<(), RuntimeError> {
        let data = self.path();
        if layers.stack.iter().all(|l| l.pins == 0) {
            while layers.stack.len() > 1 {
                unmount_top(&data)?;
                layers.stack.pop();
            }
            self.replace_or_stack(layers, fresh)
        } else if layers.stack.last().is_some_and(|top| top.pins == 0) {
            self.replace_or_stack(layers, fresh)
        } else {
            stack(fresh, &data)?;
            layers.stack.push(Layer { generation: layers.generation, pins: 0 });
            Ok(())
        }
    }

    /// Replaces the top layer (or places the first) with the mount at `fresh`; stacks it
    /// where the kernel cannot mount beneath.
    fn replace_or_stack(&self, layers: &mut Layers, fresh: &Path) -> Result<(), RuntimeError> {
        let data = self.path();
        let layer = Layer { generation: layers.generation, pins: 0 };
        if layers.stack.is_empty() {
            stack(fresh, &data)?;
            layers.stack.push(layer);
            return Ok(());
        }
        if layers.beneath_works {
            match mount_beneath(fresh, &data) {
                Ok(()) => {
                    unmount_top(&data)?;
                    *layers.stack.last_mut().expect("not empty") = layer;
                    return Ok(());
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM)) => {
                    eprintln!("insitu-isp: the kernel cannot mount beneath ({e}); the view stacks a mount per refresh while containers run");
                    layers.beneath_works = false;
                }
                Err(e) => return Err(RuntimeError::Setup(format!("mounting the fresh view beneath {}: {e}", data.display()))),
            }
        }
        if layers.stack.len() == 1 && layers.stack[0].pins == 0 {
            // Nothing uses the view: unmount, then mount (empty in between for no one).
            unmount_top(&data)?;
            layers.stack.pop();
        }
        stack(fresh, &data)?;
        layers.stack.push(layer);
        Ok(())
    }

    /// The block device (major, minor) the newest view is mounted from; `None` before the
    /// first [`SharableView::refresh`] that mounted one.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.lock().device
    }

    /// Unmounts everything the view mounted (at shutdown).
    pub fn close(&self) {
        let data = self.path();
        // Every layer and the shared mount point itself; a bound guards against a mount
        // that will not go.
        for _ in 0..4096 {
            if !is_mount_point(&data) || umount2(&data, libc::MNT_DETACH).is_err() {
                break;
            }
        }
        self.lock().stack.clear();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("gen-") {
                    if is_mount_point(&e.path()) {
                        let _ = umount2(&e.path(), libc::MNT_DETACH);
                    }
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
    }
}

/// Mounts `image` (holding a file system of type `fstype`) read-only at `at` through a
/// loop device of its own; returns the device.
fn mount_fresh(image: &Path, fstype: &str, at: &Path) -> Result<(u32, u32), RuntimeError> {
    std::fs::create_dir_all(at).map_err(|e| RuntimeError::io(at, e))?;
    // ext4 must not replay the journal of a file system the host has mounted; xfs the same.
    let opts = match fstype {
        "xfs" => "ro,norecovery,nouuid",
        "ext4" | "ext3" => "ro,noload",
        _ => "ro",
    };
    // A loop device of its own, read-only: `mount -o loop` would refuse a file the host
    // has mounted already, and a device shared with the host would share its cache.
    let out =
        Command::new("losetup").args(["--find", "--show", "--read-only"]).arg(image).output().map_err(|e| RuntimeError::Setup(format!("losetup: {e}")))?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!("losetup {}: {}", image.display(), String::from_utf8_lossy(&out.stderr).trim())));
    }
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mounted = run("mount", &["-o", opts, &dev, &path_str(at)]);
    let number = device_number(&dev);
    // Detaching now only marks it: the kernel frees it when the last mount goes.
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    mounted?;
    number.ok_or_else(|| RuntimeError::Setup(format!("{dev}: not a block device")))
}

/// Mounts a bind of `fresh` on top of `data`.
fn stack(fresh: &Path, data: &Path) -> Result<(), RuntimeError> {
    run("mount", &["--bind", &path_str(fresh), &path_str(data)])
}

/// Unmounts the top mount on `data` (lazily: a process inside it keeps its files).
fn unmount_top(data: &Path) -> Result<(), RuntimeError> {
    umount2(data, libc::MNT_DETACH).map_err(|e| RuntimeError::Setup(format!("unmounting the old view on {}: {e}", data.display())))
}

/// Mounts a copy of the mount at `fresh` beneath the top mount on `data`
/// (`open_tree(2)`, then `move_mount(2)` with `MOVE_MOUNT_BENEATH`).
fn mount_beneath(fresh: &Path, data: &Path) -> std::io::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_BENEATH: libc::c_uint = 0x200;
    let from = cstring(fresh)?;
    let to = cstring(data)?;
    // SAFETY: open_tree with a NUL-terminated path; the result is a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, from.as_ptr(), OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open_tree and is owned by nothing else.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    use std::os::fd::AsRawFd;
    // SAFETY: move_mount with the tree's descriptor, an empty and a NUL-terminated path.
    let r = unsafe {
        libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), c"".as_ptr(), libc::AT_FDCWD, to.as_ptr(), MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_BENEATH)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn umount2(path: &Path, flags: libc::c_int) -> std::io::Result<()> {
    let p = cstring(path)?;
    // SAFETY: umount2 with a NUL-terminated path.
    if unsafe { libc::umount2(p.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn cstring(p: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte"))
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
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| t.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))).unwrap_or(false)
}

fn fs_type(image: &Path) -> String {
    Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(image)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
