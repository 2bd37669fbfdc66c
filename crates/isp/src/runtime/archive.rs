// SPDX-License-Identifier: Apache-2.0
//! `docker cp`: a container's files as a tar stream, and a tar stream unpacked into them,
//! on its root file system (the overlay, mounted for the moment when the container does
//! not run). Binds (`/data`, volumes) are outside it.
//!
//! Paths are resolved inside the root file system as the container would see them: a
//! symbolic link is followed relative to the container's `/`, never to the target's, so
//! no path a client gives and no link a container made leads out of it. An archive to
//! unpack is checked whole before anything is written: an entry that climbs (`..`), an
//! absolute one, or a device node refuses it, and nothing changes.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use super::{Container, Runtime, RuntimeError};

/// What `HEAD`/`GET .../archive` tell of a path (the `X-Docker-Container-Path-Stat`
/// header, JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathStat {
    /// The last component of the path.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Go's `os.FileMode` bits (type bits and permissions), which clients decode.
    pub mode: u32,
    /// Modification time, RFC 3339.
    pub mtime: String,
    /// Where a symbolic link points ("" otherwise).
    pub link_target: String,
}

impl PathStat {
    /// The JSON the header carries.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"name": self.name, "size": self.size, "mode": self.mode, "mtime": self.mtime, "linkTarget": self.link_target})
    }
}

/// Go's `os.FileMode` of a file's metadata.
fn go_mode(m: &std::fs::Metadata) -> u32 {
    let ft = m.file_type();
    let mut mode = m.mode() & 0o777;
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        mode |= 1 << 31;
    } else if ft.is_symlink() {
        mode |= 1 << 27;
    } else if ft.is_fifo() {
        mode |= 1 << 25;
    } else if ft.is_socket() {
        mode |= 1 << 24;
    } else if ft.is_block_device() {
        mode |= 1 << 26;
    } else if ft.is_char_device() {
        mode |= (1 << 26) | (1 << 21);
    }
    let raw = m.mode();
    if raw & 0o4000 != 0 {
        mode |= 1 << 23;
    }
    if raw & 0o2000 != 0 {
        mode |= 1 << 22;
    }
    if raw & 0o1000 != 0 {
        mode |= 1 << 20;
    }
    mode
}

/// `path` (as the container names it) resolved inside `root`: `..` stops at the root and
/// symbolic links are followed inside it (at most 40); with `follow_last` false a link
/// that is the last component is not followed.
pub fn secure_join(root: &Path, path: &str, follow_last: bool) -> Result<PathBuf, String> {
    let mut pending: Vec<OsString> = Path::new(path).components().rev().filter_map(|c| name_of(c)).collect();
    let mut parts: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(c) = pending.pop() {
        if c == ".." {
            parts.pop();
            continue;
        }
        let here: PathBuf = root.iter().chain(parts.iter().map(|p| p.as_os_str())).collect::<PathBuf>().join(&c);
        let last = pending.is_empty();
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() && (follow_last || !last) => {
                links += 1;
                if links > 40 {
                    return Err(format!("{path}: too many levels of symbolic links"));
                }
                let target = std::fs::read_link(&here).map_err(|e| format!("{path}: {e}"))?;
                if target.is_absolute() {
                    parts.clear();
                }
                pending.extend(target.components().rev().filter_map(|c| name_of(c)));
            }
            _ => parts.push(c),
        }
    }
    Ok(parts.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

fn name_of(c: Component) -> Option<OsString> {
    match c {
        Component::Normal(x) => Some(x.to_os_string()),
        Component::ParentDir => Some("..".into()),
        _ => None,
    }
}

fn stat_of(path: &Path, name: &str) -> Result<PathStat, std::io::Error> {
    let m = std::fs::symlink_metadata(path)?;
    let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let link_target = if m.file_type().is_symlink() { std::fs::read_link(path)?.to_string_lossy().into_owned() } else { String::new() };
    Ok(PathStat { name: name.to_string(), size: m.len(), mode: go_mode(&m), mtime: super::log::timestamp(mtime), link_target })
}

/// The name a path's entry gets: its last component (`/` for the root).
fn base_name(path: &str) -> String {
    Path::new(path).file_name().map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned())
}

/// Checks an archive to unpack: every entry relative, without `..`, of a kind that may be
/// made (files, directories, links), links naming entries the same way. Returns the
/// number of entries.
pub fn check_archive(r: impl Read) -> Result<usize, String> {
    let mut ar = tar::Archive::new(r);
    let mut n = 0;
    for e in ar.entries().map_err(|e| format!("not a tar archive: {e}"))? {
        let e = e.map_err(|e| format!("not a tar archive: {e}"))?;
        let p = e.path().map_err(|e| format!("bad entry name: {e}"))?.into_owned();
        check_name(&p)?;
        match e.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::Directory | tar::EntryType::Symlink => {}
            tar::EntryType::Link => {
                let to = e.link_name().map_err(|err| format!("{}: {err}", p.display()))?.unwrap_or_default().into_owned();
                check_name(&to)?;
            }
            tar::EntryType::XHeader | tar::EntryType::XGlobalHeader | tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {}
            other => return Err(format!("{}: entries of type {other:?} (devices, fifos) are refused", p.display())),
        }
        n += 1;
    }
    Ok(n)
}

/// Unpacks the archive at `tar` (plain or gzip) into the directory `dir`, after checking
/// it whole with [`check_archive`]: an archive with `..`, absolute names or devices is
/// refused and nothing is written.
pub fn unpack_checked(tar: &Path, dir: &Path) -> Result<(), String> {
    let open = || -> Result<Box<dyn Read>, String> {
        let mut f = std::fs::File::open(tar).map_err(|e| format!("{}: {e}", tar.display()))?;
        let mut magic = [0u8; 2];
        let gzip = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
        std::io::Seek::rewind(&mut f).map_err(|e| e.to_string())?;
        Ok(if gzip { Box::new(flate2::read::GzDecoder::new(f)) } else { Box::new(f) })
    };
    check_archive(open()?)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    unpack(dir, "/", open()?, false)
}

fn check_name(p: &Path) -> Result<(), String> {
    if p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir | Component::Prefix(_) | Component::RootDir)) {
        return Err(format!("archive entry {:?} climbs out of its destination ('..' or an absolute path); nothing was copied", p.display().to_string()));
    }
    Ok(())
}

/// Makes directory `rel` (a relative path) under `dest`, each component resolved inside
/// `root`; returns where it is.
fn make_dirs(root: &Path, dest_in_root: &str, rel: &Path) -> Result<PathBuf, String> {
    let mut sofar = PathBuf::from(dest_in_root);
    let mut at = secure_join(root, dest_in_root, true)?;
    for c in rel.components() {
        let Component::Normal(x) = c else { continue };
        sofar.push(x);
        at = secure_join(root, &sofar.to_string_lossy(), true)?;
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{}: not a directory", sofar.display())),
            Err(_) => std::fs::create_dir(&at).map_err(|e| format!("{}: {e}", sofar.display()))?,
        }
    }
    Ok(at)
}

/// Unpacks a checked archive into directory `dest` (as the container names it) of `root`.
fn unpack(root: &Path, dest: &str, r: impl Read, no_overwrite_dir_non_dir: bool) -> Result<(), String> {
    let mut ar = tar::Archive::new(r);
    for e in ar.entries().map_err(|e| e.to_string())? {
        let mut e = e.map_err(|e| e.to_string())?;
        let rel = e.path().map_err(|e| e.to_string())?.into_owned();
        let ty = e.header().entry_type();
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), n.to_os_string()),
            _ => continue, // "." itself: the destination exists already
        };
        let dir = make_dirs(root, dest, &parent)?;
        let at = dir.join(&name);
        let shown = Path::new(dest).join(&rel).display().to_string();
        let existing = std::fs::symlink_metadata(&at).ok();
        if let Some(m) = &existing {
            let is_dir = m.is_dir();
            if no_overwrite_dir_non_dir && is_dir != (ty == tar::EntryType::Directory) {
                return Err(format!(
                    "cannot overwrite {} {shown} with a {}",
                    if is_dir { "directory" } else { "non-directory" },
                    if is_dir { "non-directory" } else { "directory" }
                ));
            }
            if !(is_dir && ty == tar::EntryType::Directory) {
                if is_dir {
                    std::fs::remove_dir_all(&at).map_err(|err| format!("{shown}: {err}"))?;
                } else {
                    std::fs::remove_file(&at).map_err(|err| format!("{shown}: {err}"))?;
                }
            }
        }
        let mode = e.header().mode().unwrap_or(0o644) & 0o7777;
        match ty {
            tar::EntryType::Directory => {
                if existing.as_ref().is_none_or(|m| !m.is_dir()) {
                    std::fs::create_dir(&at).map_err(|err| format!("{shown}: {err}"))?;
                }
                let _ = std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(mode)
                    .open(&at)
                    .map_err(|err| format!("{shown}: {err}"))?;
                std::io::copy(&mut e, &mut f).map_err(|err| format!("{shown}: {err}"))?;
                let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
            }
            tar::EntryType::Symlink => {
                let to = e.link_name().map_err(|err| err.to_string())?.unwrap_or_default().into_owned();
                std::os::unix::fs::symlink(&to, &at).map_err(|err| format!("{shown}: {err}"))?;
            }
            tar::EntryType::Link => {
                let to = e.link_name().map_err(|err| err.to_string())?.unwrap_or_default().into_owned();
                let src = secure_join(root, &Path::new(dest).join(&to).to_string_lossy(), false)?;
                std::fs::hard_link(&src, &at).map_err(|err| format!("{shown}: {err}"))?;
            }
            _ => continue,
        }
        let (uid, gid) = (e.header().uid().unwrap_or(0) as u32, e.header().gid().unwrap_or(0) as u32);
        let _ = std::os::unix::fs::lchown(&at, Some(uid), Some(gid));
        if ty != tar::EntryType::Symlink {
            if let Ok(t) = e.header().mtime() {
                let _ = std::fs::File::open(&at).and_then(|f| f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(t)));
            }
        }
    }
    Ok(())
}

impl Runtime {
    /// Runs `f` on the container's root file system, mounting it for the moment when the
    /// container does not run (and leaving a running one's mount alone).
    fn with_rootfs<T>(&self, c: &Container, f: impl FnOnce(&Path) -> Result<T, RuntimeError>) -> Result<T, RuntimeError> {
        if c.layers.is_empty() && self.images.get(&c.image_id).is_err() {
            return Err(RuntimeError::Conflict(format!("the image of container {} was removed", c.name())));
        }
        let _g = c.fs_lock();
        let rootfs = c.dir.join("rootfs");
        let mounted = super::view::is_mount_point(&rootfs);
        if !mounted {
            super::process::mount_rootfs(&c.layers, &c.dir, &rootfs)?;
        }
        let r = f(&rootfs);
        if !mounted {
            let _ = super::process::unmount(&rootfs);
        }
        r
    }

    /// Where `path` of container `c` is on the target, with `root` its root file system:
    /// inside the bind that covers it (a volume, `/data`, `/kv`), else inside the root;
    /// and whether it is read-only there.
    fn locate(&self, c: &Container, root: &Path, path: &str, follow_last: bool) -> Result<(PathBuf, bool), RuntimeError> {
        let mut clean: Vec<String> = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    clean.pop();
                }
                p => clean.push(p.to_string()),
            }
        }
        let lexical = format!("/{}", clean.join("/"));
        let mut binds: Vec<(String, String, bool)> =
            self.binds(&c.spec)?.into_iter().filter_map(|b| if let super::Bind::Path { src, dst, ro } = b { Some((src, dst, ro)) } else { None }).collect();
        binds.sort_by_key(|b| std::cmp::Reverse(b.1.len()));
        for (src, dst, ro) in binds {
            let dst = dst.trim_end_matches('/');
            if let Some(rest) = lexical.strip_prefix(dst).filter(|r| r.is_empty() || r.starts_with('/')) {
                let at = secure_join(Path::new(&src), rest, follow_last).map_err(RuntimeError::BadRequest)?;
                return Ok((at, ro));
            }
        }
        let at = secure_join(root, path, follow_last).map_err(RuntimeError::BadRequest)?;
        Ok((at, c.spec.options.readonly_rootfs))
    }

    /// `HEAD /containers/{id}/archive?path=`: what the path is.
    pub fn archive_stat(&self, key: &str, path: &str) -> Result<PathStat, RuntimeError> {
        let c = self.get(key)?;
        self.with_rootfs(&c, |root| {
            let (at, _) = self.locate(&c, root, path, false)?;
            stat_of(&at, &base_name(path)).map_err(|_| RuntimeError::NotFound(format!("Could not find the file {path} in container {}", c.name())))
        })
    }

    /// `GET /containers/{id}/archive?path=`: the path as a tar archive written to `out`
    /// (a directory with its contents, under the path's last name; `DIR/.` its contents
    /// alone), and what the path is.
    pub fn archive_get(&self, key: &str, path: &str, out: &mut std::fs::File) -> Result<PathStat, RuntimeError> {
        let c = self.get(key)?;
        self.with_rootfs(&c, |root| {
            let contents_only = path.ends_with("/.");
            let follow = path.ends_with('/') || contents_only;
            let (at, _) = self.locate(&c, root, path, follow)?;
            let stat = stat_of(&at, &base_name(path.trim_end_matches("/.").trim_end_matches('/')))
                .map_err(|_| RuntimeError::NotFound(format!("Could not find the file {path} in container {}", c.name())))?;
            let mut b = tar::Builder::new(out);
            b.follow_symlinks(false);
            let name = if contents_only { ".".to_string() } else { stat.name.clone() };
            let m = std::fs::symlink_metadata(&at).map_err(|e| RuntimeError::io(&at, e))?;
            let written = if m.is_dir() { b.append_dir_all(&name, &at) } else { b.append_path_with_name(&at, &name) };
            written.and_then(|_| b.finish()).map_err(|e| RuntimeError::Setup(format!("archiving {path}: {e}")))?;
            Ok(stat)
        })
    }

    /// `docker export`: the whole root file system as a tar archive written to `out`.
    pub fn export(&self, key: &str, out: &mut std::fs::File) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        self.with_rootfs(&c, |root| {
            let mut b = tar::Builder::new(out);
            b.follow_symlinks(false);
            b.append_dir_all(".", root).and_then(|_| b.finish()).map_err(|e| RuntimeError::Setup(format!("exporting container {}: {e}", c.name())))
        })
    }

    /// `PUT /containers/{id}/archive?path=DIR`: unpacks the tar archive in file `tar` into
    /// directory `DIR`, after checking all of it (see [`check_archive`]).
    pub fn archive_put(&self, key: &str, path: &str, tar: &Path, no_overwrite_dir_non_dir: bool) -> Result<(), RuntimeError> {
        let c = self.get(key)?;
        let open = || std::fs::File::open(tar).map_err(|e| RuntimeError::io(tar, e));
        check_archive(open()?).map_err(RuntimeError::BadRequest)?;
        self.with_rootfs(&c, |root| {
            let (at, ro) = self.locate(&c, root, path, true)?;
            match std::fs::metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(RuntimeError::BadRequest(format!("extraction point is not a directory: {path}"))),
                Err(_) => return Err(RuntimeError::NotFound(format!("Could not find the file {path} in container {}", c.name()))),
            }
            if ro {
                return Err(RuntimeError::Conflict(format!("copying into {path} of container {}: it is on a read-only file system", c.name())));
            }
            // Unpacked with the destination as the root: links resolve inside it.
            unpack(&at, "/", open()?, no_overwrite_dir_non_dir).map_err(|m| RuntimeError::BadRequest(format!("copying into {path}: {m}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, ty, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*ty);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            // Set the name by bytes: the builder's own checks would refuse `..`.
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/", root.join("up")).unwrap();
        std::os::unix::fs::symlink("../../../../etc", root.join("etc/climb")).unwrap();
        assert_eq!(secure_join(root, "/up/etc/passwd", true).unwrap(), root.join("etc/passwd"));
        assert_eq!(secure_join(root, "../../etc", true).unwrap(), root.join("etc"));
        assert_eq!(secure_join(root, "/etc/climb/x", true).unwrap(), root.join("etc/x"));
        assert_eq!(secure_join(root, "/up", false).unwrap(), root.join("up"));
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(secure_join(root, "/loop/x", true).is_err());
    }

    #[test]
    fn archives_that_climb_are_refused_before_anything_is_written() {
        let ok = tar_of(&[
            ("d/", tar::EntryType::Directory, b"", ""),
            ("d/f", tar::EntryType::Regular, b"hi", ""),
            ("d/l", tar::EntryType::Symlink, b"", "/etc/passwd"),
        ]);
        assert_eq!(check_archive(&ok[..]), Ok(3));
        for bad in [
            tar_of(&[("ok", tar::EntryType::Regular, b"x", ""), ("../escape", tar::EntryType::Regular, b"x", "")]),
            tar_of(&[("a/../../b", tar::EntryType::Regular, b"x", "")]),
            tar_of(&[("/abs", tar::EntryType::Regular, b"x", "")]),
            tar_of(&[("h", tar::EntryType::Link, b"", "../../etc/shadow")]),
            tar_of(&[("dev", tar::EntryType::Block, b"", "")]),
        ] {
            assert!(check_archive(&bad[..]).is_err());
        }
        assert!(check_archive(&b"not a tar at all, just some text"[..]).is_err() || check_archive(&b"not a tar at all, just some text"[..]) == Ok(0));
    }

    #[test]
    fn unpacking_stays_inside_and_replaces_links_rather_than_following_them() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let outside = d.path().join("outside");
        std::fs::create_dir_all(root.join("dst")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // A link the container made, pointing at the target's directory by absolute path.
        std::os::unix::fs::symlink(&outside, root.join("dst/trap")).unwrap();
        std::os::unix::fs::symlink(outside.join("file"), root.join("dst/f")).unwrap();
        let t =
            tar_of(&[("f", tar::EntryType::Regular, b"new", ""), ("sub/", tar::EntryType::Directory, b"", ""), ("trap/x", tar::EntryType::Regular, b"in", "")]);
        check_archive(&t[..]).unwrap();
        let r = unpack(&root, "/dst", &t[..], false);
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing was written outside the root: {r:?}");
        assert_eq!(std::fs::read(root.join("dst/f")).unwrap(), b"new");
        assert!(root.join("dst/sub").is_dir());
    }

    proptest::proptest! {
        #[test]
        fn random_archives_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = check_archive(&b[..]);
        }

        #[test]
        fn joined_paths_stay_inside(p in "[a-z./]{0,30}") {
            let d = tempfile::tempdir().unwrap();
            let j = secure_join(d.path(), &p, true).unwrap();
            proptest::prop_assert!(j.starts_with(d.path()));
        }
    }
}
