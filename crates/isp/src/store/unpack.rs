// SPDX-License-Identifier: Apache-2.0
//! Unpacking a layer into a directory overlayfs can stack, refusing anything that would
//! land outside it.
//!
//! A layer is hostile input: an entry may name `../x` or `/etc/x`, hard-link to a file
//! outside, or climb through a symlink an earlier entry planted (`a -> /`, then `a/etc`).
//! Every entry's path is checked component by component against what is already on disk
//! (never following a symlink), so the unpacked tree stays inside its directory. Whiteouts
//! become what overlayfs understands: `.wh.NAME` a 0:0 character device, `.wh..wh..opq`
//! the `trusted.overlay.opaque` attribute.

use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::ImageError;

/// A reader that hashes what passes through it (the diff id of a layer is the sha256 of
/// its uncompressed tar).
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Unpacks the layer in `blob` (tar, or gzip-compressed tar) into `dest` (which must not
/// exist); returns its diff id (`sha256:<hex>` of the uncompressed tar) and the bytes
/// written. On error `dest` is removed.
pub fn unpack_layer(blob: &Path, dest: &Path, name: &str) -> Result<(String, u64), ImageError> {
    let r = unpack_inner(blob, dest, name);
    if r.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    r
}

fn unpack_inner(blob: &Path, dest: &Path, name: &str) -> Result<(String, u64), ImageError> {
    let io_err = |e: io::Error| ImageError::Io { path: blob.to_path_buf(), source: e };
    let mut f = std::fs::File::open(blob).map_err(io_err)?;
    let mut magic = [0u8; 4];
    let n = f.read(&mut magic).map_err(io_err)?;
    let gz = n >= 2 && magic[..2] == [0x1f, 0x8b];
    if n == 4 && magic == [0x28, 0xb5, 0x2f, 0xfd] {
        return Err(ImageError::Malformed(format!("layer {name} is zstd-compressed; only gzip and plain tar layers are supported")));
    }
    drop(f);
    let f = std::fs::File::open(blob).map_err(io_err)?;
    let raw: Box<dyn Read> = if gz { Box::new(flate2::read::GzDecoder::new(f)) } else { Box::new(f) };
    let mut hr = HashingReader { inner: raw, hasher: Sha256::new() };
    std::fs::create_dir(dest).map_err(|e| ImageError::Io { path: dest.to_path_buf(), source: e })?;
    let mut size = 0u64;
    // Directories' times are set last: entries written into them change them.
    let mut dir_times: Vec<(PathBuf, u64)> = Vec::new();
    {
        let mut ar = tar::Archive::new(&mut hr);
        let entries = ar.entries().map_err(|e| malformed(name, &e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| malformed(name, &e))?;
            let rel = entry.path().map_err(|e| malformed(name, &e))?.into_owned();
            let rel = clean(&rel).ok_or_else(|| escapes(name, &rel))?;
            if rel.as_os_str().is_empty() {
                continue;
            }
            let file_name = rel.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let parent = rel.parent().unwrap_or(Path::new(""));
            let dir = inside(dest, parent, name, &rel)?;
            if file_name == ".wh..wh..opq" {
                mkdirs(&dir, name, &rel)?;
                set_opaque(&dir)?;
                continue;
            }
            if file_name.starts_with(".wh..wh.") {
                // aufs bookkeeping (`.wh..wh.plnk`, `.wh..wh.aufs`): nothing for overlayfs.
                continue;
            }
            if let Some(hidden) = file_name.strip_prefix(".wh.") {
                if hidden.is_empty() || hidden == "." || hidden == ".." {
                    return Err(escapes(name, &rel));
                }
                mkdirs(&dir, name, &rel)?;
                let target = dir.join(hidden);
                remove_any(&target);
                mknod_whiteout(&target)?;
                continue;
            }
            let target = dir.join(&file_name);
            let hdr = entry.header().clone();
            let mode = hdr.mode().unwrap_or(0o644) & 0o7777;
            let kind = hdr.entry_type();
            let ioe = |e: io::Error| ImageError::Io { path: target.clone(), source: e };
            mkdirs(&dir, name, &rel)?;
            match kind {
                tar::EntryType::Directory => {
                    if let Ok(m) = std::fs::symlink_metadata(&target) {
                        if !m.is_dir() {
                            remove_any(&target);
                        }
                    }
                    mkdirs(&target, name, &rel)?;
                    set_perm(&target, mode, &hdr)?;
                    dir_times.push((target.clone(), hdr.mtime().unwrap_or(0)));
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    remove_any(&target);
                    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(ioe)?;
                    size += io::copy(&mut entry, &mut out).map_err(ioe)?;
                    drop(out);
                    set_perm(&target, mode, &hdr)?;
                    set_mtime(&target, hdr.mtime().unwrap_or(0));
                }
                tar::EntryType::Symlink => {
                    let to = entry.link_name().map_err(|e| malformed(name, &e))?.ok_or_else(|| malformed(name, &"symlink without a target"))?;
                    remove_any(&target);
                    // A symlink may point anywhere: it is resolved inside the container's
                    // root, and no later entry is ever written through it.
                    std::os::unix::fs::symlink(&to, &target).map_err(ioe)?;
                    let _ = lchown(&target, &hdr);
                    set_mtime(&target, hdr.mtime().unwrap_or(0));
                }
                tar::EntryType::Link => {
                    let to = entry.link_name().map_err(|e| malformed(name, &e))?.ok_or_else(|| malformed(name, &"hard link without a target"))?;
                    let to = clean(&to).ok_or_else(|| escapes(name, &to))?;
                    let src = inside(dest, &to, name, &to)?;
                    match std::fs::symlink_metadata(&src) {
                        Ok(m) if m.is_file() => {}
                        _ => return Err(escapes(name, &to)),
                    }
                    remove_any(&target);
                    std::fs::hard_link(&src, &target).map_err(ioe)?;
                }
                // Devices, fifos and the rest: a container gets its devices from the
                // runtime, never from an image.
                _ => {}
            }
        }
        // Trailing padding, so the hash covers the whole tar as the config names it.
        io::copy(ar.into_inner(), &mut io::sink()).map_err(|e| malformed(name, &e))?;
    }
    for (d, t) in dir_times.iter().rev() {
        set_mtime(d, *t);
    }
    sync_fs(dest)?;
    Ok((format!("sha256:{}", hex::encode(hr.hasher.finalize())), size))
}

fn malformed(layer: &str, e: &dyn std::fmt::Display) -> ImageError {
    ImageError::Malformed(format!("layer {layer}: not a valid tar archive: {e}"))
}

fn escapes(layer: &str, path: &Path) -> ImageError {
    ImageError::LayerEscapes { layer: layer.to_string(), path: path.display().to_string() }
}

/// The path without `.`; `None` if it is absolute or climbs with `..`.
fn clean(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// `root/rel`, checking that no existing component of it is a symlink.
fn inside(root: &Path, rel: &Path, layer: &str, entry: &Path) -> Result<PathBuf, ImageError> {
    let mut p = root.to_path_buf();
    for c in rel.components() {
        p.push(c);
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            if m.file_type().is_symlink() {
                return Err(escapes(layer, entry));
            }
        }
    }
    Ok(p)
}

/// `create_dir_all`, where a parent that is not a directory is the layer's fault.
fn mkdirs(dir: &Path, layer: &str, entry: &Path) -> Result<(), ImageError> {
    std::fs::create_dir_all(dir).map_err(|e| match e.kind() {
        io::ErrorKind::NotADirectory | io::ErrorKind::AlreadyExists => {
            ImageError::Malformed(format!("layer {layer}: entry {:?} is under something that is not a directory", entry.display().to_string()))
        }
        _ => ImageError::Io { path: dir.to_path_buf(), source: e },
    })
}

fn remove_any(p: &Path) {
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if m.is_dir() {
            let _ = std::fs::remove_dir_all(p);
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn cpath(p: &Path) -> Result<CString, ImageError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| ImageError::Malformed(format!("{}: a NUL in a path", p.display())))
}

fn set_perm(p: &Path, mode: u32, hdr: &tar::Header) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    let _ = lchown(p, hdr);
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(|e| ImageError::Io { path: p.to_path_buf(), source: e })
}

fn lchown(p: &Path, hdr: &tar::Header) -> Result<(), ImageError> {
    let (uid, gid) = (hdr.uid().unwrap_or(0) as u32, hdr.gid().unwrap_or(0) as u32);
    let c = cpath(p)?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    unsafe { libc::lchown(c.as_ptr(), uid, gid) };
    Ok(())
}

/// Sets the modification (and access) time of `p`, not following a symlink; best effort.
fn set_mtime(p: &Path, secs: u64) {
    let Ok(c) = cpath(p) else { return };
    let t = libc::timespec { tv_sec: secs.min(i64::MAX as u64) as libc::time_t, tv_nsec: 0 };
    let times = [t, t];
    // SAFETY: c is a valid NUL-terminated path and `times` two valid timespecs, both alive
    // for the duration of the call.
    unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
}

/// Flushes the file system holding `dir`, so a layer renamed into place is on disk.
fn sync_fs(dir: &Path) -> Result<(), ImageError> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir).map_err(|e| ImageError::Io { path: dir.to_path_buf(), source: e })?;
    // SAFETY: the descriptor is open for the duration of the call.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(ImageError::Io { path: dir.to_path_buf(), source: io::Error::last_os_error() });
    }
    Ok(())
}

fn mknod_whiteout(p: &Path) -> Result<(), ImageError> {
    let c = cpath(p)?;
    // SAFETY: c is a valid NUL-terminated path; a 0:0 character device is overlayfs's whiteout.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
    if rc != 0 {
        return Err(ImageError::Io { path: p.to_path_buf(), source: io::Error::last_os_error() });
    }
    Ok(())
}

fn set_opaque(dir: &Path) -> Result<(), ImageError> {
    let c = cpath(dir)?;
    let name = b"trusted.overlay.opaque\0";
    // SAFETY: valid NUL-terminated path and attribute name; the value is one byte.
    let rc = unsafe { libc::lsetxattr(c.as_ptr(), name.as_ptr().cast(), b"y".as_ptr().cast(), 1, 0) };
    if rc != 0 {
        return Err(ImageError::Io { path: dir.to_path_buf(), source: io::Error::last_os_error() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data, link) in entries {
            let mut h = tar::Header::new_old();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o755);
            // Raw names: the builder itself refuses `..`, a hostile layer does not.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(l) = link {
                h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn try_unpack(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> (Result<(String, u64), ImageError>, tempfile::TempDir) {
        let d = tempfile::tempdir().unwrap();
        let blob = d.path().join("blob");
        std::fs::write(&blob, tar_of(entries)).unwrap();
        (unpack_layer(&blob, &d.path().join("layer"), "test"), d)
    }

    #[test]
    fn ordinary_layers_unpack_with_whiteouts() {
        let (r, d) = try_unpack(&[
            ("bin/", tar::EntryType::Directory, b"", None),
            ("bin/tool", tar::EntryType::Regular, b"#!/bin/sh\n", None),
            ("bin/alias", tar::EntryType::Symlink, b"", Some("tool")),
            ("bin/hard", tar::EntryType::Link, b"", Some("bin/tool")),
            ("etc/.wh.gone", tar::EntryType::Regular, b"", None),
        ]);
        let (diff, size) = r.unwrap();
        assert!(diff.starts_with("sha256:") && size == 10);
        let l = d.path().join("layer");
        assert_eq!(std::fs::read(l.join("bin/hard")).unwrap(), b"#!/bin/sh\n");
        assert_eq!(std::fs::read_link(l.join("bin/alias")).unwrap(), Path::new("tool"));
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(l.join("etc/gone")).unwrap().file_type().is_char_device());
    }

    #[test]
    fn escaping_entries_are_refused_and_leave_nothing() {
        for bad in [
            vec![("../escaped", tar::EntryType::Regular, &b"x"[..], None)],
            vec![("/abs", tar::EntryType::Regular, &b"x"[..], None)],
            vec![("a", tar::EntryType::Symlink, &b""[..], Some("/tmp")), ("a/planted", tar::EntryType::Regular, &b"x"[..], None)],
            vec![("h", tar::EntryType::Link, &b""[..], Some("../../etc/passwd"))],
        ] {
            let (r, d) = try_unpack(&bad);
            assert!(matches!(r, Err(ImageError::LayerEscapes { .. })), "{bad:?}: {r:?}");
            assert!(!d.path().join("layer").exists());
        }
        assert!(!Path::new("/tmp/planted").exists());
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let d = tempfile::tempdir().unwrap();
            let blob = d.path().join("blob");
            std::fs::write(&blob, &b).unwrap();
            let _ = unpack_layer(&blob, &d.path().join("layer"), "fuzz");
        }
    }
}
